from flask_wtf import FlaskForm
from wtforms import EmailField, PasswordField
from wtforms.validators import DataRequired, Length, Regexp

# Same rule as app.auth.service (no email_validator dependency, no DNS look-ups).
EMAIL = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"


class LoginForm(FlaskForm):
    email = EmailField("Email", validators=[DataRequired(), Length(max=255),
                                            Regexp(EMAIL, message="must be an email address")])
    password = PasswordField("Password", validators=[DataRequired(), Length(max=1024)])

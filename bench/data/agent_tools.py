"""The agent workload of bench/agent_tools.py: 50 tools in ten domains (OpenAI function
definitions of the size real agents carry, ~150-250 tokens each) and 40 tasks, each a
user request and the tool calls a correct agent makes for it, in order (1-3 calls)."""
from __future__ import annotations

# (name, description, {parameter: description})
_T = [
    # weather / time
    ("get_current_weather", "Return the current weather conditions for a city: temperature, "
     "sky, wind and humidity, as reported by the nearest station in the last hour.",
     {"city": "City name, optionally with country code", "units": "metric or imperial",
      "include_air_quality": "Also return the air quality index"}),
    ("get_weather_forecast", "Return the daily weather forecast for a city for up to ten "
     "days ahead, with rain probability, high and low temperatures and weather alerts.",
     {"city": "City name, optionally with country code", "days": "Number of days ahead, 1-10",
      "units": "metric or imperial"}),
    ("get_local_time", "Return the current local date and time in a timezone or city, with "
     "its UTC offset and whether daylight saving time is in effect.",
     {"location": "IANA timezone or city name"}),
    ("convert_timezone", "Convert a date and time from one timezone to another, taking "
     "daylight saving time rules of both zones into account.",
     {"datetime": "ISO 8601 date and time", "from_zone": "Source timezone",
      "to_zone": "Target timezone"}),
    ("get_sunrise_sunset", "Return sunrise, sunset and day length for a location on a date.",
     {"location": "City or coordinates", "date": "ISO 8601 date"}),
    # email / messaging
    ("send_email", "Send an email from the user's mailbox to one or more recipients with a "
     "subject and a plain-text or HTML body, optionally with attachments from the drive.",
     {"to": "Recipient addresses", "subject": "Subject line", "body": "Message body",
      "attachments": "Drive file ids to attach"}),
    ("search_emails", "Search the user's mailbox by sender, subject words, date range or "
     "label and return matching messages with their ids and snippets.",
     {"query": "Search words", "sender": "From address", "after": "ISO date",
      "before": "ISO date", "label": "Mailbox label"}),
    ("read_email", "Return the full content, headers and attachment list of one email "
     "message by its id.", {"message_id": "Id returned by search_emails"}),
    ("send_slack_message", "Post a message to a Slack channel or a direct message to a "
     "colleague, optionally in a thread.",
     {"channel": "Channel name or user handle", "text": "Message text",
      "thread_ts": "Thread to reply in"}),
    ("send_sms", "Send a text message to a phone number.",
     {"phone_number": "E.164 phone number", "text": "Message text"}),
    # calendar / tasks
    ("create_calendar_event", "Create a meeting or event in the user's calendar with a "
     "title, start and end time, attendees and a video-call link.",
     {"title": "Event title", "start": "ISO 8601 start", "end": "ISO 8601 end",
      "attendees": "Attendee emails", "add_video_link": "Attach a video-call link"}),
    ("list_calendar_events", "List the events in the user's calendar between two dates, "
     "with their times, attendees and locations.",
     {"start": "ISO 8601 date", "end": "ISO 8601 date"}),
    ("find_free_time", "Find time slots when all the given people are free in their "
     "calendars, within working hours, for a meeting of a given length.",
     {"attendees": "Emails", "duration_minutes": "Meeting length", "within_days": "Look ahead"}),
    ("create_task", "Add a to-do item to the user's task list with a due date and priority.",
     {"title": "Task title", "due": "ISO date", "priority": "low, normal or high"}),
    ("set_reminder", "Set a reminder that notifies the user at a given time with a note.",
     {"time": "ISO 8601 date and time", "note": "What to remind about"}),
    # travel
    ("search_flights", "Search airline flights between two airports on a date, returning "
     "fares, airlines, departure and arrival times and number of stops.",
     {"origin": "IATA airport code", "destination": "IATA airport code",
      "date": "ISO date", "cabin": "economy, premium, business or first",
      "passengers": "Number of passengers"}),
    ("book_flight", "Book a flight offer returned by search_flights for the named "
     "passengers and charge the company card.",
     {"offer_id": "Id of the flight offer", "passenger_names": "Full names",
      "seat_preference": "aisle or window"}),
    ("search_hotels", "Search hotels in a city for check-in and check-out dates, with "
     "price per night, rating, distance to the center and free cancellation.",
     {"city": "City", "check_in": "ISO date", "check_out": "ISO date", "guests": "Guests"}),
    ("book_hotel", "Reserve a room from a hotel offer returned by search_hotels.",
     {"offer_id": "Hotel offer id", "guest_name": "Name on the booking"}),
    ("get_flight_status", "Return the live status of a flight: delays, gate, terminal and "
     "estimated departure and arrival.", {"flight_number": "Airline code and number",
                                          "date": "ISO date"}),
    # finance
    ("get_stock_quote", "Return the latest trading price, daily change and volume of a "
     "stock by its ticker symbol.", {"ticker": "Stock ticker symbol"}),
    ("convert_currency", "Convert an amount of money from one currency to another at "
     "today's exchange rate.", {"amount": "Amount", "from_currency": "ISO 4217 code",
                                "to_currency": "ISO 4217 code"}),
    ("get_account_balance", "Return the balance of one of the company's bank accounts.",
     {"account_id": "Bank account id"}),
    ("create_invoice", "Create and send an invoice to a customer with line items, tax and "
     "payment terms.", {"customer_id": "CRM customer id", "items": "Line items",
                        "due_days": "Payment term in days"}),
    ("list_transactions", "List bank account transactions in a date range, filtered by "
     "counterparty or amount.", {"account_id": "Bank account id", "after": "ISO date",
                                 "before": "ISO date", "counterparty": "Name"}),
    # CRM / sales
    ("search_customers", "Find customers in the CRM by name, company, email or phone.",
     {"query": "Search text"}),
    ("get_customer", "Return a CRM customer record with contacts, plan, open deals and "
     "support history.", {"customer_id": "CRM customer id"}),
    ("update_deal_stage", "Move a sales deal to another pipeline stage with a note.",
     {"deal_id": "Deal id", "stage": "Pipeline stage", "note": "Why"}),
    ("log_call", "Record a phone call with a customer in the CRM with notes and outcome.",
     {"customer_id": "CRM customer id", "notes": "Call notes", "outcome": "Outcome"}),
    ("create_support_ticket", "Open a support ticket for a customer problem with a "
     "priority and a description.", {"customer_id": "CRM customer id",
                                     "subject": "Summary", "priority": "P1-P4"}),
    # files / documents
    ("search_drive", "Search the shared drive for documents, spreadsheets and slides by "
     "name or content words.", {"query": "Search words", "file_type": "doc, sheet or slides"}),
    ("read_document", "Return the text content of a document on the drive.",
     {"file_id": "Drive file id"}),
    ("create_document", "Create a new document on the drive with a title and content.",
     {"title": "Document title", "content": "Markdown content", "folder": "Folder"}),
    ("share_file", "Share a drive file with people, with view or edit rights.",
     {"file_id": "Drive file id", "emails": "People to share with", "role": "viewer or editor"}),
    ("summarize_document", "Summarize a long document on the drive into key points.",
     {"file_id": "Drive file id", "max_words": "Summary length"}),
    # devops / engineering
    ("get_service_status", "Return the health, error rate and latency of a production "
     "service from the monitoring system.", {"service": "Service name"}),
    ("list_open_incidents", "List open incidents with severity, owner and start time.",
     {"severity": "SEV1-SEV4"}),
    ("restart_service", "Restart a production service deployment in a region.",
     {"service": "Service name", "region": "Cloud region"}),
    ("create_github_issue", "Open an issue in a GitHub repository with a title, body and "
     "labels.", {"repo": "owner/name", "title": "Issue title", "body": "Details",
                 "labels": "Labels"}),
    ("query_logs", "Search application logs for a service in a time window by text.",
     {"service": "Service name", "query": "Search text", "minutes": "Look-back window"}),
    # shopping / food
    ("search_products", "Search the online store catalogue for products by words, "
     "category and price range.", {"query": "Search words", "max_price": "Price cap"}),
    ("place_order", "Order products to the user's address with the saved card.",
     {"product_ids": "Products", "quantities": "Quantities"}),
    ("track_package", "Return the delivery status and location of a parcel.",
     {"tracking_number": "Carrier tracking number"}),
    ("find_restaurants", "Find restaurants near a place by cuisine, price and rating.",
     {"location": "Address or city", "cuisine": "Cuisine", "price_level": "1-4"}),
    ("book_restaurant", "Reserve a table at a restaurant for a number of people.",
     {"restaurant_id": "Restaurant id", "time": "ISO 8601", "party_size": "People"}),
    # knowledge / media
    ("web_search", "Search the web and return the top results with titles, links and "
     "snippets.", {"query": "Search words", "num_results": "How many"}),
    ("get_news_headlines", "Return today's top news headlines on a topic or in a country.",
     {"topic": "Topic", "country": "ISO country code"}),
    ("translate_text", "Translate text into another language.",
     {"text": "Text", "target_language": "Language code"}),
    ("calculate", "Evaluate an arithmetic or unit-conversion expression exactly.",
     {"expression": "Expression"}),
    ("play_music", "Play a song, album, artist or playlist on the user's speaker.",
     {"query": "What to play", "device": "Speaker name"}),
]

_BOILERPLATE = (" Use only when the user asks for it; never guess values the user did not "
                "give, ask instead.")


def tools() -> list[dict]:
    out = []
    for name, desc, params in _T:
        out.append({"type": "function", "function": {
            "name": name, "description": desc + _BOILERPLATE,
            "parameters": {"type": "object", "properties": {
                p: {"type": "string", "description": d} for p, d in params.items()},
                "required": list(params)[:1], "additionalProperties": False}}})
    return out


# (user request, [tools a correct agent calls, in order])
TASKS = [
    ("Will I need an umbrella in Seattle this weekend?", ["get_weather_forecast"]),
    ("What's it like outside in Madrid right now?", ["get_current_weather"]),
    ("What time is it in Singapore?", ["get_local_time"]),
    ("My call is at 3pm New York time, what is that in Berlin?", ["convert_timezone"]),
    ("When does the sun set in Reykjavik today?", ["get_sunrise_sunset"]),
    ("Email the Q3 report to dana@acme.com with the subject 'Q3 numbers'.",
     ["search_drive", "send_email"]),
    ("Did Priya send me anything about the offsite last week? Open it.",
     ["search_emails", "read_email"]),
    ("Tell the #platform channel on Slack that the deploy is done.", ["send_slack_message"]),
    ("Text my wife at +14155550100 that I'm running late.", ["send_sms"]),
    ("Set up a 30 minute meeting with Tom and Ana sometime this week.",
     ["find_free_time", "create_calendar_event"]),
    ("What's on my calendar tomorrow?", ["list_calendar_events"]),
    ("Add 'renew passport' to my to-do list for Friday, high priority.", ["create_task"]),
    ("Remind me at 5pm to call the plumber.", ["set_reminder"]),
    ("Find me a flight from Boston to Denver on May 3 and book the cheapest one.",
     ["search_flights", "book_flight"]),
    ("I need a hotel in Lisbon from June 2 to June 5, book a good one near the center.",
     ["search_hotels", "book_hotel"]),
    ("Is flight UA 837 on time today?", ["get_flight_status"]),
    ("How is Nvidia stock doing today?", ["get_stock_quote"]),
    ("How much is 2,500 euros in Japanese yen?", ["convert_currency"]),
    ("What's the balance of our operating account?", ["get_account_balance"]),
    ("Bill Globex for 40 hours of consulting, due in 30 days.",
     ["search_customers", "create_invoice"]),
    ("Show me every payment to AWS from the main account in March.", ["list_transactions"]),
    ("Pull up everything we know about Initech.", ["search_customers", "get_customer"]),
    ("Move the Hooli renewal deal to 'negotiation', they asked for a discount.",
     ["update_deal_stage"]),
    ("Log my call with Umbrella Corp: they want a demo next week.",
     ["search_customers", "log_call"]),
    ("Stark Industries can't log in to the dashboard, open a P1 ticket for them.",
     ["search_customers", "create_support_ticket"]),
    ("Find the onboarding deck and share it with new.hire@acme.com.",
     ["search_drive", "share_file"]),
    ("Give me the key points of the security policy document.",
     ["search_drive", "summarize_document"]),
    ("Write up a doc called 'Retro notes' with what went well and badly this sprint.",
     ["create_document"]),
    ("Is the checkout service healthy? Its errors were spiking earlier.",
     ["get_service_status", "query_logs"]),
    ("Which SEV1 incidents are open right now?", ["list_open_incidents"]),
    ("The search service in eu-west-1 is stuck, restart it and check it came back.",
     ["restart_service", "get_service_status"]),
    ("File a bug in acme/web: the login button does nothing on Safari.",
     ["create_github_issue"]),
    ("Order two packs of AA batteries under $15.", ["search_products", "place_order"]),
    ("Where is my parcel 1Z999AA10123456784?", ["track_package"]),
    ("Book a table for four at a good Thai place near Union Square at 7pm.",
     ["find_restaurants", "book_restaurant"]),
    ("What's the latest news about the chip export rules?", ["get_news_headlines"]),
    ("Translate 'the shipment is delayed until Monday' into German.", ["translate_text"]),
    ("What is 17.5% of 2,340?", ["calculate"]),
    ("Put on some Miles Davis in the living room.", ["play_music"]),
    ("Search the web for the Postgres 18 release date, then put a reminder on that day.",
     ["web_search", "set_reminder"]),
]

# The same 40 kinds of task asked again in other words, with other names and places (a
# workflow's second day): the tools each needs are the task's in TASKS.
PARAPHRASES = [
    "Is it going to rain in Portland on Saturday or Sunday?",
    "How warm is it in Athens at the moment?",
    "Tell me the current time over in Sydney.",
    "The vendor call is 10am Chicago time; when is that for me in Paris?",
    "What time is sunset in Oslo this evening?",
    "Send the board deck to li.wei@acme.com by email, subject 'Deck for Thursday'.",
    "Has Marco written to me about the budget review? Show me the message.",
    "Post in #releases on Slack that version 4.2 is live.",
    "Send a text to +447700900123 saying the meeting moved to 4.",
    "Find an hour next week when Sam, Ravi and I are all free and book it.",
    "What meetings do I have on Monday?",
    "Put 'submit expense report' on my task list, due Wednesday.",
    "Ping me at 9am tomorrow to water the plants.",
    "Get me on a flight from Chicago to Miami on July 9, cheapest fare, and book it.",
    "Book me a well-rated hotel in Prague for August 1 to August 4.",
    "Has LH 400 from Frankfurt been delayed today?",
    "What's Microsoft's share price right now?",
    "Convert 900 US dollars to Swiss francs.",
    "How much money is in the payroll account?",
    "Send Acme Widgets an invoice for 12 licence seats, payable in 14 days.",
    "List the payments we made to Salesforce from the main account in January.",
    "What do we have on file for Wayne Enterprises?",
    "Set the Cyberdyne expansion deal to 'closed won', they signed today.",
    "Note my call with Soylent: they're unhappy about pricing.",
    "Wonka Industries reports data loss in exports, raise a P1 for them.",
    "Locate the brand guidelines file and give maria@acme.com edit access.",
    "Summarize the travel policy doc for me.",
    "Create a document named 'Q4 plan' listing our three priorities.",
    "Check whether the payments API is okay; the on-call saw timeouts.",
    "Any SEV2 incidents still open?",
    "Bounce the auth service in us-east-1 and confirm it's healthy again.",
    "Open an issue in acme/mobile: push notifications arrive twice on Android.",
    "Buy a USB-C charger under $30.",
    "Track shipment 9400111899223344556677 for me.",
    "Reserve dinner for two at a sushi restaurant near the Ferry Building at 8.",
    "Any headlines today about the central bank rate decision?",
    "How do you say 'the invoice is attached' in Spanish?",
    "What's 3.2% of 18,750?",
    "Play the Beatles on the kitchen speaker.",
    "Look up online when the next Python release ships and remind me that morning.",
]

# A third day: the same 40 kinds of task in yet other words, written before the scoring was
# reworked (2026-12-04); held out from the first round of changes (chosen on day 1), seen by
# the second (chosen on days 1-3), which HELDOUT_2 is held out from.
HELDOUT = [
    "Should I pack a raincoat for Vancouver next Tuesday?",
    "Is it windy in Chicago right now?",
    "Is it still morning in Tokyo?",
    "If I schedule the standup at 9:30 London time, what hour is that in Los Angeles?",
    "How early does it get light in Helsinki tomorrow?",
    "Mail the signed contract PDF to legal@acme.com, subject 'Contract'.",
    "I think HR sent me something about benefits enrollment; find it and show me the full "
    "text.",
    "Let the #support folks know in Slack that the outage is resolved.",
    "Message +16175550199 by SMS: pick up milk on the way home.",
    "Find a slot on Thursday when Jo and I can talk for 45 minutes and put it in our "
    "calendars.",
    "Am I busy on Friday afternoon?",
    "Make a to-do: update the vendor contract, due end of month.",
    "Nudge me in two hours to stretch.",
    "I need to fly Seattle to Austin next Monday morning; pick the cheapest and reserve it.",
    "Get me a room in Berlin for three nights from October 10, near the train station.",
    "Did AF 22 land yet?",
    "Where is Tesla trading right now?",
    "What are 300 pounds worth in Canadian dollars?",
    "How much cash is left in the savings account?",
    "Charge Vandelay Industries 5,000 dollars for the setup work, net 60.",
    "What did we spend at Google Cloud out of the main account last quarter?",
    "Give me the full profile of the client Massive Dynamic.",
    "Mark the Oscorp deal as lost in the CRM; they went with a competitor.",
    "Record that I phoned Tyrell Corp and they want a quote by Friday.",
    "Aperture Science's invoices page is throwing errors; escalate it to support as urgent.",
    "Give the finance team view access to the 2027 budget spreadsheet.",
    "What does the remote work guideline say, in a few bullets?",
    "Start a new doc titled 'Launch checklist' with the steps we agreed on.",
    "Users say the billing service is slow; check its health and the recent error logs.",
    "Are there any outages being worked on at the moment?",
    "Reboot the notifications worker in ap-south-1 and verify it recovers.",
    "Report a bug on acme/api: the export endpoint returns 500 for empty lists.",
    "Get me a new wireless mouse, nothing over $40.",
    "Has my order with tracking number 1Z12345E0205271688 shipped yet?",
    "Find an Italian spot in SoHo for six people Saturday at 8 and reserve it.",
    "What are the papers saying about the election today?",
    "Put 'thank you for your patience' into French.",
    "Work out 1,250 times 0.35 for me.",
    "Start some jazz on the bedroom speaker.",
    "Find out on the internet when the next iPhone launch event is and set a reminder for it.",
]

# A fourth day, held out from the second round of scoring changes (written after day 3's
# figures were seen, before that round; never used to choose a weight or a rule).
HELDOUT_2 = [
    "Do I need sunscreen in Phoenix on Thursday and Friday?",
    "Tell me the temperature in Dublin right now.",
    "What's the clock saying in Mumbai?",
    "Our partner in Tokyo suggested 8am their time on Tuesday; what is that for me in Berlin?",
    "At what time is dawn in Cape Town tomorrow?",
    "Attach the pricing sheet from the drive and email it to sales@acme.com, subject 'Prices'.",
    "Did the landlord reply to my email about the lease? Read it to me.",
    "Drop a note in #design on Slack that the mockups are ready for review.",
    "SMS +12025550147: the delivery is at the back door.",
    "Schedule a one hour review with Kim and Lee on a day they're both free.",
    "Show my agenda for next Wednesday.",
    "Add a task to renew the domain name, due the 15th.",
    "Alert me at 6:30 to leave for the airport.",
    "Look for nonstop flights from Dallas to Toronto on the 12th and book the earliest.",
    "Find a hotel with a pool in Barcelona, July 20 to 23, and reserve it.",
    "What's the status of BA 117 this afternoon?",
    "Quote me Amazon's stock price.",
    "How many Mexican pesos do I get for 150 dollars?",
    "What's left in the marketing budget account?",
    "Invoice Pied Piper for the March retainer, 8,000 dollars, due on receipt.",
    "Which card transactions over $500 went out of the main account this week?",
    "Show me the CRM record for Dunder Mifflin.",
    "Advance the Gekko & Co deal to proposal stage.",
    "Write down that I talked with Bluth Company and they will renew next month.",
    "Cyberdyne's users get logged out every few minutes; file a high priority support case.",
    "Share the Q2 board minutes with auditor@acme.com as read-only.",
    "Boil down the vendor security questionnaire to five lines.",
    "Draft a new document 'Hiring plan 2027' with a section per team.",
    "Is the inventory service up? Pull its logs from the last hour too.",
    "What incidents are we currently handling?",
    "Kick the payments worker in eu-central-1 and make sure it's running afterwards.",
    "Create a GitHub ticket in acme/infra: the nightly backup job fails silently.",
    "Order a pack of printer paper, A4, cheapest option.",
    "Where is the parcel with tracking 1Z0X118A0324011023 now?",
    "Get us a table for three at a steakhouse downtown tomorrow at 7:30.",
    "Anything in the news about the merger talks?",
    "Render 'please confirm your attendance' in Italian.",
    "What's 48 divided by 0.6?",
    "Queue up some lo-fi beats on the office speaker.",
    "Google the date of the next Kubernetes release and set me a reminder for that day.",
]

# A fifth day, written (2026-12-04) before a third round of scoring changes and committed on
# its own before it: the same 40 kinds of task in other words, names and places, with other
# phrasing habits (indirect requests, questions, multi-step asks). Held out from that round:
# never used to choose a weight or a rule.
HELDOUT_3 = [
    "We're planning a barbecue in Melbourne on Sunday; any chance it gets rained out?",
    "Could you check what the conditions are like in Nairobi at this moment?",
    "I'm about to phone my cousin in Auckland; would it be the middle of the night there?",
    "A webinar starts at 2pm Pacific on Thursday. I'm in Warsaw, so when should I join?",
    "I want to photograph the sunrise in Porto on Saturday; what time should I be out there?",
    "Could you dig up the vendor comparison spreadsheet from our shared files and send it "
    "over to jun.park@acme.com? Subject can be 'Vendors'.",
    "I'm fairly sure the accountant emailed me about the VAT filing a few days ago; can you "
    "pull that up so I can read it?",
    "Can you give the #qa team a heads-up on Slack that staging is frozen until noon?",
    "Would you shoot a quick text to +61491570156 letting them know the keys are under the "
    "mat?",
    "Nadia, Omar and I need 20 minutes together before Friday; see when we're all open and "
    "get it on the calendar.",
    "Do I have anything scheduled for Tuesday morning, or is it clear?",
    "Could you note on my to-do list that I have to book the car service by next Thursday?",
    "Make sure I remember to pick up the dry cleaning at 4pm today.",
    "What's the cheapest way to fly from Atlanta to Seattle on September 14? Go ahead and "
    "book it once you've found it.",
    "We'll be in Vienna for the conference from March 8 to 11; can you find a place to stay "
    "close to the venue and reserve it?",
    "My sister is coming in on KL 601; is it running late?",
    "How are Apple shares trading this morning?",
    "If I exchange 75,000 Korean won, roughly how many euros would I end up with?",
    "Do we have enough in the reserve account to cover payroll? What's it at?",
    "Initrode still owes us for the data migration; can you bill them 3,200 dollars with "
    "45-day terms?",
    "Were there any charges from Zoom on the main account in the last two months?",
    "Before I meet Prestige Worldwide tomorrow, what does our CRM say about them?",
    "The Nakatomi deal has reached contract review; could you update the pipeline?",
    "I just got off the phone with Globo Gym; they're thinking about adding ten seats. Can "
    "you put that in the CRM?",
    "Sirius Cybernetics can't upload files since this morning; could you get a high-priority "
    "ticket open for them?",
    "Could Pat from legal (pat@acme.com) get edit rights on the partnership agreement?",
    "I don't have time to read the whole incident postmortem file; what are the main "
    "takeaways?",
    "Can you set up a fresh doc called 'Interview questions' with a few starter questions?",
    "Something seems off with the search indexer; is it healthy, and what do its recent "
    "logs show?",
    "Is anything on fire right now? Show me which incidents are still unresolved.",
    "The email sender in us-west-2 has hung again; can you give it a restart and then make "
    "sure it's back up?",
    "Could you log a bug against acme/desktop saying the app crashes when the window is "
    "resized?",
    "We're out of whiteboard markers; can you get a box of them, ideally under $20?",
    "When's the package with tracking 1Z4A9W700345821102 supposed to arrive?",
    "Is there a decent vegetarian restaurant around Kings Cross? Book it for five on Friday "
    "at 6.",
    "What's being reported today about the airline strike?",
    "How would I write 'the meeting is postponed' in Portuguese?",
    "If I split 1,940 across 7 people, how much does each pay?",
    "Could you put on some Norah Jones in the study?",
    "When does early-bird registration for PyCon close? Check online and remind me the day "
    "before.",
]

# A sixth day, written and committed with HELDOUT_3 and not run by the bench until the third
# round of scoring changes was fixed: day 5's misses were seen (its before-figure lists
# them), this day's were not. Terse asks, context first, other verbs.
HELDOUT_4 = [
    "Heading to Edinburgh Wednesday through Friday; what should I expect weather-wise?",
    "Is it snowing in Denver at the moment?",
    "Quick one: what's the hour in Dubai now?",
    "Our Sao Paulo office wants a sync at 11am their time Monday. What's that in Tokyo time?",
    "How many hours of daylight will Stockholm get on the solstice?",
    "The auditors want last year's expense summary. Find it on the drive and email it to "
    "audit@acme.com with subject 'Expenses 2025'.",
    "Anything in my inbox from the recruiter at Stripe? I'd like to see what she said.",
    "Let everyone in #general know on Slack that lunch is on the company today.",
    "Text +33612345678 that the train is delayed twenty minutes.",
    "Get a 1:1 with Bea on the books in the next few days, whenever we both have a free half "
    "hour.",
    "What does the rest of my week look like?",
    "Stick 'review the Q1 OKRs' on my todo list for Monday, low priority.",
    "At 8pm tonight I need a ping to take my medication.",
    "Two of us need to get from Newark to Rome on October 2 in business class; find options "
    "and book the best one.",
    "Need somewhere to sleep in Kyoto on the 5th and 6th of November, close to Gion; book it.",
    "Which gate is DL 44 leaving from, and is it on schedule?",
    "How did Netflix stock move today?",
    "Turn 12,000 Indian rupees into British pounds for me.",
    "Tell me the current figure on the tax reserve account.",
    "Send a bill to Hooli XYZ for the two onsite training days, 6,400 total, 30 days to pay.",
    "I need every outgoing transfer to our landlord from the main account since January.",
    "Who is our contact at Monsters Inc and what plan are they on?",
    "We lost the Ghostbusters deal to budget cuts; reflect that in the pipeline.",
    "Spoke with Los Pollos Hermanos earlier; they're happy, no changes. Log it.",
    "Weyland-Yutani's SSO integration is broken for all their staff; raise a P2 on their "
    "behalf.",
    "Let contractor@acme.com view the API design slides.",
    "TL;DR of the 40-page data retention policy, please.",
    "New doc please: 'Team offsite agenda', with a rough outline for two days.",
    "Latency alerts are firing for the recommendations service; how's it doing and what do "
    "the logs say for the last 30 minutes?",
    "Give me a rundown of the open SEV3 and SEV4 incidents.",
    "Please cycle the image-resizer deployment in eu-north-1 and tell me if it comes back "
    "healthy.",
    "Put an issue on acme/docs: the install page links to a dead URL.",
    "Can you find a standing desk mat for under $60 and buy it?",
    "Is my FedEx delivery 7489 2210 5533 out for delivery yet?",
    "Somewhere with good ramen near Shibuya for two tonight at 7, please reserve.",
    "Catch me up on today's top stories in Germany.",
    "I need 'your package has arrived' in Japanese.",
    "Compute the square root of 2,209.",
    "Some classical piano in the lounge, please.",
    "Look up when the tax filing deadline is this year and make sure I get reminded a week "
    "ahead.",
]

# A seventh and an eighth day, written (2026-12-04) and committed on their own before a
# fourth round of retrieval changes, without running the selector on them: the same 40 kinds
# of task in other words, names and places. Day 7 mostly full, polite sentences; day 8 terse
# shorthand, as a colleague types in chat. Held out from that round (chosen on days 1-6):
# never used to choose a weight, a rule or a policy.
HELDOUT_5 = [
    "Thinking of hiking near Lake Tahoe on Saturday; will the weather hold up?",
    "What's the weather doing in Lagos right this minute?",
    "My team in Jakarta just pinged me; what time is it for them now?",
    "The board meeting is Wednesday at 4pm Sydney time. What is that in Toronto?",
    "What time does the sun come up in Anchorage on Sunday?",
    "Grab the customer churn analysis from the shared drive and email it to ines@acme.com "
    "with the subject 'Churn'.",
    "I think my dentist's office emailed to move my appointment. Can you find that message "
    "and open it?",
    "Post on Slack in #marketing that the campaign launches at noon.",
    "Send an SMS to +4915112345678: running ten minutes behind, start without me.",
    "I need an hour with Felix, Greta and Hugo sometime in the next two weeks; check when "
    "everyone is available and send the invite.",
    "Which meetings are on my schedule for Thursday?",
    "Add 'file the insurance claim' to my tasks, due next Tuesday, normal priority.",
    "Remind me tomorrow at 10 to call the bank about the card.",
    "Look up flights from Houston to San Francisco on November 21 and book me on the "
    "cheapest.",
    "Find me accommodation in Amsterdam from April 14 to April 17 near Centraal station and "
    "book it.",
    "Is Emirates EK 202 departing on time?",
    "What is Shopify's share price doing today?",
    "Convert 4,800 Swedish kronor into US dollars.",
    "What's the current balance on the escrow account?",
    "Invoice Umbrella Health for 25 hours of design work, payment due in 21 days.",
    "Pull all the transactions with Delta Air Lines from the main account in February.",
    "Show me the CRM record for Tessier-Ashpool, with their open deals.",
    "Push the Vehement Capital deal forward to 'verbal commit'.",
    "I had a call with Oceanic Airlines this morning; they want to pause until Q3. Please "
    "log it.",
    "Veridian Dynamics says their reports page won't load for anyone; open a P2 support "
    "ticket for them.",
    "Find the Q3 roadmap slides and share them with design@acme.com so they can edit.",
    "Can you give me a short summary of the employee handbook on the drive?",
    "Create a new doc 'Vendor review 2027' with headings for cost, quality and risk.",
    "The notifications service is throwing 502s; what's its status and what do the logs "
    "say?",
    "List the incidents that are open, whatever the severity.",
    "Restart the ledger-sync service in us-central1 and check it's healthy afterwards.",
    "Raise a GitHub issue in acme/sdk: the Python client ignores the timeout setting.",
    "I need an ergonomic keyboard under $100; find one and order it.",
    "What's the status of my parcel TBA123456789000?",
    "Book a table for eight at a tapas bar near Plaza Mayor on Thursday at 9pm.",
    "Give me the top headlines about the climate summit.",
    "Translate 'the office is closed on Friday' into Dutch.",
    "What's a 15% tip on a $86.40 bill?",
    "Play Taylor Swift's latest album in the garage.",
    "Search online for when the Black Friday sales start this year and set a reminder for "
    "the day before.",
]

HELDOUT_6 = [
    "Forecast for Munich, next three days?",
    "Current conditions in Honolulu?",
    "Local time in Buenos Aires, please.",
    "If the launch goes live at midnight UTC, what's that on the US east coast?",
    "Sunrise and sunset times for Tromso on December 21?",
    "Send finance@acme.com the latest headcount sheet from the drive by email. Subject: "
    "Headcount.",
    "Look through my mail for the flight confirmation from Iberia and pull up the whole "
    "thing.",
    "Slack #eng-leads: code freeze starts tomorrow at 6pm.",
    "Shoot +13105550188 a text: I'm outside.",
    "Book a 15-minute chat with Carla next week at a time that works for both of us.",
    "Anything on my calendar between 2 and 5 today?",
    "To-do: order new badges for the interns. High priority, due Monday.",
    "Reminder for 7:15 tomorrow: submit timesheet.",
    "One-way Phoenix to Portland on Jan 8, economy, cheapest; book it.",
    "Hotel in Zurich, Feb 3-6, under 250 a night. Find one and book it.",
    "AA 100 JFK-LHR: delayed or on time?",
    "Ticker check: AMD.",
    "50,000 yen to dollars?",
    "Balance on the petty cash account?",
    "Bill Krusty Krab Ltd 1,200 dollars for the catering platform setup, due in 10 days.",
    "Any refunds from Stripe hitting the main account this month?",
    "Pull the customer file for Spacely Sprockets.",
    "Cogswell Cogs deal -> closed lost.",
    "Call log: spoke to Rekall Inc's CTO, interested in the enterprise tier.",
    "Ticket for Duff Brewery: their webhook deliveries stopped, P3.",
    "Give ops@acme.com edit access to the on-call rota spreadsheet.",
    "Key points from the Q3 customer survey report?",
    "Start a doc: 'Postmortem - DNS outage', leave the sections empty.",
    "Health check on the auth-gateway service, plus the last 15 min of its error logs.",
    "Open incidents: anything SEV1 or SEV2?",
    "Restart order-router in eu-west-2, then confirm it's green.",
    "New issue, acme/cli: --verbose flag is ignored on Windows.",
    "Buy a 2m HDMI cable, cheapest decent one.",
    "Tracking 92612999897543581074, where is it?",
    "Dim sum for six near Chinatown, Sunday 12:30, book somewhere good.",
    "Headlines on the World Cup today?",
    "Spanish for 'we're sold out until next week'?",
    "Calculate 2^20 minus 1,000.",
    "Throw on a Radiohead playlist in the car.",
    "Check the web for the AWS re:Invent keynote date and remind me the morning of.",
]

# Day 9, written on 2026-12-06 (session 40) before the name-only tier was chosen and
# before any selector ran on it: its first run is the held-out figure for that choice.
HELDOUT_7 = [
    "Should I pack a raincoat for Glasgow over the next couple of days?",
    "How hot is it in Phoenix at the moment?",
    "Is it still morning in Honolulu?",
    "Our standup is 9:30 Pacific. When is that for the folks in Bangalore?",
    "How much daylight will Oslo get on the winter solstice; when does the sun rise and set?",
    "Attach the signed NDA from our drive to an email to counsel@acme.com, subject 'NDA'.",
    "The landlord wrote to me about the lease renewal a few days ago; dig out that email "
    "and show it to me.",
    "Let the #support team know on Slack that the status page is back up.",
    "Message +447700900123 by text: the keys are under the mat.",
    "Get me 45 minutes with Ravi and Lena before Friday, whenever all three of us are free, "
    "and put it in the calendar.",
    "Am I free on Monday morning or is something booked?",
    "Put 'renew the car registration' on my list, due the 30th, low priority.",
    "Ping me at 8pm to take the laundry out.",
    "I need to get from Chicago to Austin on March 12; find the flights and book the lowest "
    "fare.",
    "Somewhere to stay in Kyoto, 9 to 12 October, close to the station; pick one and "
    "reserve it.",
    "Has BA 286 from San Francisco landed yet?",
    "Where is Microsoft trading right now?",
    "What do 900 Swiss francs come to in British pounds?",
    "How much money is left in the payroll account?",
    "Send Soylent Corp an invoice: 12 hours of data migration, net 45.",
    "List what we paid Google Cloud out of the main account last quarter.",
    "Everything in the CRM about Wayne Enterprises, please.",
    "The Massive Dynamic opportunity is now at 'proposal sent'.",
    "Note down that I talked to Cyberdyne's procurement lead; they need a security "
    "questionnaire.",
    "Acme Rockets can't export CSVs from the billing page; raise a P2 ticket for them.",
    "Locate the brand guidelines PDF and give brand@acme.com view access.",
    "What does the travel expense policy say, in a few bullet points?",
    "Draft a fresh document named 'Hiring plan H1' with a section per team.",
    "Payments-api looks unhappy; how is it doing and what's in its recent error logs?",
    "Is anything currently on fire? Show me the open incidents.",
    "Bounce the image-resizer service in ap-south-1 and make sure it comes back healthy.",
    "Open a GitHub bug in acme/mobile: push notifications arrive twice on Android.",
    "Get me a USB-C charger under $30 and place the order.",
    "Any update on shipment 1Z12345E0205271688?",
    "Find a ramen place near Shibuya for two at 8 tonight and reserve it.",
    "What are the papers saying about the rate decision?",
    "How do you say 'please sign both copies' in Italian?",
    "What's 3,250 divided by 13?",
    "Some lo-fi beats in the study, please.",
    "Look up online when the Apple WWDC keynote is and remind me that morning.",
]

# Day 10, written on 2026-12-06 (session 40) after day 9's first run and before the change
# it suggested (a tool sent by name brings its lookup by name) and before any selector ran
# on it: its first run is the held-out figure for that change.
HELDOUT_8 = [
    "Is there snow in the forecast for Denver through Sunday?",
    "Tell me the temperature and wind in Cape Town right now.",
    "What's the clock saying in Dubai?",
    "Our partner call is 11am London time on Thursday. What time is that in Chicago?",
    "When is golden hour in Santorini tomorrow? I need the sunset time.",
    "Find the 2027 budget spreadsheet in the drive and email it to cfo@acme.com, subject "
    "'Budget'.",
    "My accountant mailed me about last year's tax return. Could you find that email and "
    "read it to me?",
    "Drop a note in #design on Slack: new mockups are in Figma.",
    "Text +16175550199 that dinner is pushed to 8.",
    "Find a slot next week when Omar, Priyanka and I are all free for an hour and book it.",
    "What have I got on Wednesday afternoon?",
    "New task: 'update the on-call runbook', due end of month, medium priority.",
    "Remind me in two hours to stretch.",
    "Cheapest nonstop from Atlanta to Seattle on April 2, and book it for me.",
    "I'll be in Barcelona from May 10 to 13; find a hotel near the beach and book it.",
    "Is Lufthansa LH 400 to New York delayed?",
    "Quote for Tesla shares, please.",
    "How many Canadian dollars is 1,000 euros?",
    "How much cash is in the marketing account?",
    "Raise an invoice to Gringotts Bank for 60 hours of audit support, due in 15 days.",
    "Which transactions went to Salesforce from the main account in January?",
    "Open the CRM profile for Sirius Cybernetics and show me everything.",
    "Mark the Blue Sun deal as 'won'.",
    "Record a call with Tyrell Corp: they asked for volume pricing.",
    "Monsters Inc can't reset passwords; file a P1 support ticket for them.",
    "Share the Q4 OKR doc from the drive with leads@acme.com.",
    "Boil down the remote work policy on the drive to five bullets.",
    "Make a new document called 'Offsite agenda' with a section for each day.",
    "Why is the email-sender service failing? Give me its status and recent logs.",
    "Show me every incident that hasn't been resolved yet.",
    "The geo-lookup service in us-west-2 is hung; restart it and check it's back.",
    "Log a bug in acme/api on GitHub: pagination returns duplicates.",
    "Order a pack of 100 sticky notes, under $10.",
    "Where's my package with tracking 9400111899223847565431?",
    "Reserve a table for three at a sushi bar near the Ferry Building at 7:30 on Friday.",
    "What's in the news about the chip shortage today?",
    "Put 'the invoice is attached' into Portuguese.",
    "What's 12% of 4,750?",
    "Play some Bach cello suites in the kitchen.",
    "Search the internet for the next SpaceX launch date and set a reminder for that day.",
]
